"""A WebShop-like product catalog and goal set generated from a seed.

Nothing here comes from the real WebShop data: brands, product types, attributes and options are
drawn from small hand-written vocabularies. The records have the fields the real engine uses
(asin, title, description, bullet points, category path "A › B › C", query, attributes, options,
price or price range) plus ``name`` and ``title_nouns``, which stand in for the spaCy parse the
real reward runs over product and goal titles (spaCy's English models cannot be installed here).

Goals follow the real instruction format:
``"{instruction} with {opt}: {value}, and {opt}: {value}, and price lower than {p:.2f} dollars"``
(without options: ``"{instruction}, and price lower than {p:.2f} dollars"``).
Train and evaluation goals are disjoint: no instruction text occurs in both.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hgpo.options import check_int

CATEGORY_SEP = " › "


@dataclass(frozen=True)
class Product:
    """One catalog record (what the real engine keeps per ASIN, plus ``name``/``title_nouns``)."""

    asin: str
    title: str
    description: str
    bullet_points: tuple[str, ...]
    category: str
    query: str
    name: str
    title_nouns: tuple[str, ...]
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]]
    price: float
    price_high: float | None = None

    @property
    def price_text(self) -> str:
        """Price as the results and item pages show it: "$19.99" or "$10.99 to $15.99"."""
        if self.price_high is None:
            return f"${self.price:.2f}"
        return f"${self.price:.2f} to ${self.price_high:.2f}"

    @property
    def search_text(self) -> str:
        """The text the real engine indexes: title, description, first bullet, options."""
        opts = ", and ".join(f"{k}: {', '.join(v)}" for k, v in self.options.items())
        first = self.bullet_points[0] if self.bullet_points else ""
        return " ".join([self.title, self.description, first, opts]).lower()


@dataclass(frozen=True)
class Goal:
    """One shopping instruction with the target it was written from."""

    asin: str
    instruction: str
    attributes: tuple[str, ...]
    options: dict[str, str]
    price_upper: float
    query: str
    category: str
    name: str
    title_nouns: tuple[str, ...]
    task_type: str = field(default="")


# (category key, category path, product types). A product type is
# (name, query, title nouns, attribute pool, option pool).
_SIZES_CLOTH = ("x-small", "small", "medium", "large", "x-large", "xx-large")
_COLORS = (
    "black",
    "white",
    "red",
    "blue",
    "navy",
    "green",
    "grey",
    "pink",
    "beige",
    "brown",
    "purple",
    "yellow",
    "orange",
    "ivory",
    "gold",
    "silver",
)
_VOCAB: dict[
    str,
    tuple[
        str,
        tuple[tuple[str, str, tuple[str, ...], tuple[str, ...], dict[str, tuple[str, ...]]], ...],
    ],
] = {
    "beauty": (
        "Beauty & Personal Care",
        (
            (
                "shampoo",
                "sulfate free shampoo",
                ("shampoo",),
                (
                    "sulfate free",
                    "paraben free",
                    "natural ingredients",
                    "dry hair",
                    "hair growth",
                    "long lasting",
                    "cruelty free",
                    "travel size",
                ),
                {
                    "size": ("8 fl oz", "16 fl oz", "32 fl oz"),
                    "scent": ("lavender", "coconut", "mint"),
                },
            ),
            (
                "lipstick",
                "matte lipstick",
                ("lipstick",),
                ("long lasting", "cruelty free", "highly pigmented", "easy apply", "vegan"),
                {"color": ("red", "pink", "nude", "purple", "brown")},
            ),
            (
                "face moisturizer",
                "face moisturizer cream",
                ("face", "moisturizer"),
                (
                    "fragrance free",
                    "dry skin",
                    "sensitive skin",
                    "anti aging",
                    "oil free",
                    "natural ingredients",
                ),
                {"size": ("1.7 oz", "3.4 oz"), "style": ("day cream", "night cream")},
            ),
            (
                "hair dryer",
                "ionic hair dryer",
                ("hair", "dryer"),
                ("fast drying", "low noise", "travel size", "easy use", "salon quality"),
                {"color": ("black", "white", "pink", "rose gold")},
            ),
            (
                "nail polish",
                "gel nail polish",
                ("nail", "polish"),
                ("long lasting", "quick dry", "non toxic", "easy apply"),
                {"color": ("red", "nude", "blue", "black", "silver", "pink")},
            ),
        ),
    ),
    "electronics": (
        "Electronics",
        (
            (
                "wireless earbuds",
                "bluetooth wireless earbuds",
                ("earbuds",),
                (
                    "noise cancelling",
                    "long battery life",
                    "water resistant",
                    "fast charging",
                    "high fidelity",
                    "easy use",
                ),
                {"color": ("black", "white", "blue", "grey")},
            ),
            (
                "phone case",
                "iphone phone case",
                ("phone", "case"),
                (
                    "shock absorbing",
                    "slim fit",
                    "wireless charging",
                    "easy install",
                    "anti scratch",
                ),
                {
                    "color": ("black", "clear", "blue", "red", "green"),
                    "size": ("iphone 13", "iphone 14", "iphone 15"),
                },
            ),
            (
                "hdmi cable",
                "high speed hdmi cable",
                ("hdmi", "cable"),
                ("high speed", "gold plated", "4k ultra hd", "plug play", "easy install"),
                {"size": ("3 ft", "6 ft", "10 ft", "15 ft")},
            ),
            (
                "portable charger",
                "usb portable charger power bank",
                ("charger", "power", "bank"),
                ("fast charging", "high capacity", "usb c", "lightweight", "easy carry"),
                {"color": ("black", "white", "blue"), "capacity": ("10000mah", "20000mah")},
            ),
            (
                "computer mouse",
                "wireless computer mouse",
                ("computer", "mouse"),
                ("wireless", "ergonomic design", "low noise", "long battery life", "plug play"),
                {"color": ("black", "grey", "white", "pink")},
            ),
        ),
    ),
    "fashion": (
        "Clothing, Shoes & Jewelry",
        (
            (
                "men's t-shirt",
                "men's cotton t-shirt",
                ("t-shirt", "men"),
                (
                    "machine wash",
                    "short sleeve",
                    "long sleeve",
                    "cotton spandex",
                    "relaxed fit",
                    "slim fit",
                ),
                {"color": _COLORS[:8], "size": _SIZES_CLOTH},
            ),
            (
                "women's running shoes",
                "women's running shoes",
                ("shoes", "women"),
                (
                    "non slip",
                    "rubber sole",
                    "lightweight",
                    "memory foam",
                    "arch support",
                    "breathable mesh",
                ),
                {"color": _COLORS[:6], "size": ("6", "6.5", "7", "7.5", "8", "8.5", "9")},
            ),
            (
                "yoga pants",
                "high waist yoga pants",
                ("yoga", "pants"),
                ("high waist", "tummy control", "moisture wicking", "quick dry", "machine wash"),
                {"color": _COLORS[:7], "size": _SIZES_CLOTH[:5]},
            ),
            (
                "winter jacket",
                "men's winter jacket",
                ("jacket", "winter"),
                ("water resistant", "hooded", "windproof", "machine wash", "warm fleece"),
                {"color": _COLORS[:6], "size": _SIZES_CLOTH},
            ),
            (
                "baseball cap",
                "adjustable baseball cap",
                ("cap", "baseball"),
                ("adjustable strap", "cotton", "breathable", "sun protection"),
                {"color": _COLORS[:8]},
            ),
        ),
    ),
    "food": (
        "Grocery & Gourmet Food",
        (
            (
                "green tea",
                "organic green tea bags",
                ("tea",),
                ("gluten free", "usda organic", "caffeine free", "non gmo", "individually wrapped"),
                {
                    "flavor name": ("jasmine", "mint", "lemon", "original"),
                    "size": ("20 count", "40 count", "100 count"),
                },
            ),
            (
                "protein bar",
                "low sugar protein bar",
                ("protein", "bar"),
                ("low sugar", "gluten free", "high protein", "keto friendly", "non gmo"),
                {
                    "flavor name": ("chocolate", "peanut butter", "vanilla", "cookie dough"),
                    "size": ("12 count", "24 count"),
                },
            ),
            (
                "coffee beans",
                "whole bean coffee",
                ("coffee", "beans"),
                ("medium roast", "dark roast", "fair trade", "usda organic", "kosher"),
                {"size": ("12 ounce", "2 pound", "5 pound")},
            ),
            (
                "trail mix",
                "healthy trail mix snack",
                ("mix", "trail"),
                ("gluten free", "non gmo", "individually wrapped", "resealable bag", "vegan"),
                {"flavor name": ("sweet", "salty", "original"), "size": ("6 pack", "12 pack")},
            ),
            (
                "olive oil",
                "extra virgin olive oil",
                ("oil", "olive"),
                ("cold pressed", "extra virgin", "non gmo", "kosher"),
                {"size": ("500 ml", "1 liter", "3 liter")},
            ),
        ),
    ),
    "furniture": (
        "Home & Kitchen",
        (
            (
                "office chair",
                "ergonomic office chair",
                ("chair", "office"),
                ("lumbar support", "height adjustable", "easy assemble", "mesh back", "heavy duty"),
                {"color": ("black", "grey", "white", "blue")},
            ),
            (
                "coffee table",
                "wood coffee table living room",
                ("table", "coffee"),
                ("solid wood", "easy assemble", "living room", "storage space", "modern design"),
                {"color": ("walnut", "white", "black", "oak"), "size": ("small", "large")},
            ),
            (
                "bed sheet set",
                "queen bed sheet set",
                ("sheet", "set", "bed"),
                ("deep pocket", "machine wash", "wrinkle free", "soft microfiber", "breathable"),
                {"color": _COLORS[:10], "size": ("twin", "full", "queen", "king")},
            ),
            (
                "bookshelf",
                "5 tier bookshelf",
                ("bookshelf",),
                ("easy assemble", "living room", "storage space", "heavy duty", "metal frame"),
                {"color": ("black", "white", "brown", "oak")},
            ),
            (
                "table lamp",
                "bedside table lamp",
                ("lamp", "table"),
                ("usb port", "dimmable", "living room", "easy install", "energy saving"),
                {"color": ("black", "white", "gold", "silver", "brown")},
            ),
        ),
    ),
}

_BRANDS = (
    "Lumora",
    "Arveno",
    "Kestrel",
    "Brightwell",
    "Novaline",
    "Ozmo",
    "Pellucid",
    "Quillon",
    "Rivana",
    "Solenne",
    "Tavrio",
    "Umbra",
    "Velacor",
    "Wynfield",
    "Xenith",
    "Yarrowby",
    "Zephra",
    "Bexley",
    "Calloway",
    "Dunmore",
)
_FILLERS = ("premium", "classic", "everyday", "deluxe", "essential", "original", "new", "pro")
_PREFIXES = ("i need", "i am looking for", "i want", "find me", "i would like", "get me")


def _asin(rng: random.Random, used: set[str]) -> str:
    chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    while True:
        a = "B0" + "".join(rng.choice(chars) for _ in range(8))
        if a not in used:
            used.add(a)
            return a


def _article(word: str) -> str:
    return "an" if word[:1] in "aeio" else "a"


def generate_catalog(seed: int = 0, n_products: int = 5000) -> list[Product]:
    """Generate ``n_products`` products spread evenly over 5 categories and 25 product types."""
    n_products = check_int("n_products", n_products, lo=1)
    rng = random.Random(seed)
    types = [(cat, path, t) for cat, (path, ts) in _VOCAB.items() for t in ts]
    used: set[str] = set()
    products = []
    for i in range(n_products):
        cat, top, (name, query, nouns, attr_pool, opt_pool) = types[i % len(types)]
        attrs = tuple(rng.sample(attr_pool, rng.randint(2, min(4, len(attr_pool)))))
        brand = rng.choice(_BRANDS)
        shown = [a for a in attrs if rng.random() < 0.6]
        title = " ".join([brand, rng.choice(_FILLERS), *shown, name]).title().replace("'S", "'s")
        if rng.random() < 0.5:
            title += f", {rng.choice(('Pack of 1', 'Pack of 2', 'Set', 'Bundle'))}"
        options: dict[str, tuple[str, ...]] = {}
        for oname, values in opt_pool.items():
            if rng.random() < 0.9:
                k = rng.randint(min(2, len(values)), len(values))
                options[oname] = tuple(sorted(rng.sample(values, k), key=values.index))
        base = round(rng.uniform(5, 150), 2)
        high = round(base * rng.uniform(1.1, 1.6), 2) if rng.random() < 0.2 else None
        sub = nouns[0]
        category = CATEGORY_SEP.join([top, cat.title(), sub.title()])
        description = (
            f"This {name} by {brand} is made for everyday use. "
            f"It is {rng.choice(_FILLERS)} quality and {attrs[0]}."
        )
        bullets = tuple(f"{a.upper()}: {rng.choice(_FILLERS)} {name} design" for a in attrs[1:])
        bullets = bullets or (f"{name} by {brand}",)
        products.append(
            Product(
                asin=_asin(rng, used),
                title=title,
                description=description,
                bullet_points=bullets,
                category=category,
                query=query,
                name=name,
                title_nouns=nouns,
                attributes=attrs,
                options=options,
                price=base,
                price_high=high,
            )
        )
    return products


def _instruction(
    rng: random.Random,
    product: Product,
    attrs: tuple[str, ...],
    options: dict[str, str],
    price_upper: float,
) -> str:
    words = " and ".join(attrs)
    core = f"{rng.choice(_PREFIXES)} {_article(words)} {words} {product.name}"
    if options:
        core += " with " + ", and ".join(f"{k}: {v}" for k, v in options.items())
    return f"{core}, and price lower than {price_upper:.2f} dollars"


def generate_goals(products: list[Product], seed: int = 0, n_goals: int = 2000) -> list[Goal]:
    """Generate up to ``n_goals`` goals with distinct instruction texts, one target each."""
    n_goals = check_int("n_goals", n_goals, lo=1)
    rng = random.Random(seed + 7919)
    seen: set[str] = set()
    goals: list[Goal] = []
    for _ in range(n_goals * 20):
        if len(goals) >= n_goals:
            break
        p = rng.choice(products)
        k = rng.randint(1, min(3, len(p.attributes)))
        attrs = tuple(rng.sample(p.attributes, k))
        opts = {n: rng.choice(v) for n, v in p.options.items()}
        upper = float(
            next(b for b in (10, 20, 30, 40, 50, 60, 80, 100, 150, 200, 300) if b > p.price)
        )
        text = _instruction(rng, p, attrs, opts, upper)
        if text in seen:
            continue
        seen.add(text)
        cat = p.category.split(CATEGORY_SEP)[1].lower()
        goals.append(
            Goal(p.asin, text, attrs, opts, upper, p.query, p.category, p.name, p.title_nouns, cat)
        )
    return goals


def split_goals(goals: list[Goal], n_eval: int = 500) -> tuple[list[Goal], list[Goal]]:
    """(train, eval): the first ``n_eval`` goals are held out, as in the real WebShop split."""
    n_eval = check_int("n_eval", n_eval, lo=0, hi=len(goals))
    return goals[n_eval:], goals[:n_eval]
