from cookmind.cli import main

raise SystemExit(main())
