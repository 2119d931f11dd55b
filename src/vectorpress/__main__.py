from vectorpress.cli import main

raise SystemExit(main())
