from streamstudio.app.cli import main

raise SystemExit(main())
