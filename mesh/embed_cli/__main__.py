from mesh.embed_cli.cli import main

main()
