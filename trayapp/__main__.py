from trayapp.cli.main import main

raise SystemExit(main())
