"""`python -m nblib ...`: the command line lives in nblib.publish.cli."""

from nblib.publish.cli import main

if __name__ == "__main__":
    main()
