from gpufleet.cli.app import main

main()
