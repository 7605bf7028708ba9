from aitbc.cli.main import main

main()
