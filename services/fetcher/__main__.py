"""Start the fetcher service: `python -m hutch.services.fetcher` (or `hutch serve fetcher`)."""

from hutch.service import main
from hutch.services.fetcher.app import SERVICE

if __name__ == "__main__":
    main(SERVICE)
