"""Start the storer service: `python -m hutch.services.storer` (or `hutch serve storer`)."""

from hutch.service import main
from hutch.services.storer.app import SERVICE

if __name__ == "__main__":
    main(SERVICE)
