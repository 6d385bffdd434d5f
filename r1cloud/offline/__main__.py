from r1cloud.offline.smollm import main

main()
