from dualbudget.cli import main

raise SystemExit(main())
