"""The ``gdn2-oracle`` subcommands, one module each (``add_parser(sub)``, ``run(args)``), and their output."""
