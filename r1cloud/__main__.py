from r1cloud.cli import main

main()
