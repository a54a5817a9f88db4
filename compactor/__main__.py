from compactor.cli import main

main()
