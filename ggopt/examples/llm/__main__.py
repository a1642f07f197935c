from ggopt.cli.llm import main

raise SystemExit(main())
