from cachedoctor.cli import main

main()
