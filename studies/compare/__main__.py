"""``python -m studies.compare`` (studies/compare_study.py says what it does)."""

from studies.compare_study import main

raise SystemExit(main())
