from ggopt.cli.finetune import main

raise SystemExit(main())
