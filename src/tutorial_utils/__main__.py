from tutorial_utils.cli import main

raise SystemExit(main())
