from trayapp.cli import main

raise SystemExit(main())
