from aifabric import main

main()
