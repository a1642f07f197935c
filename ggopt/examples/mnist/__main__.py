from ggopt.cli.mnist import main

raise SystemExit(main())
