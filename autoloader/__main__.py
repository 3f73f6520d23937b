from autoloader.cli import main

raise SystemExit(main())
