from cutegen.cli import main

main()
