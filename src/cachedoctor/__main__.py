from cachedoctor.cli import main

raise SystemExit(main())
