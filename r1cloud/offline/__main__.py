from r1cloud.offline import main

main()
