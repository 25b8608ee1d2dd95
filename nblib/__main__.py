"""`python -m nblib ...`: the command line lives in nblib.run.cli."""

from nblib.run.cli import main

if __name__ == "__main__":
    main()
