"""Start the API service: `python -m hutch.services.api` (or `hutch serve api`)."""

from hutch.service import main
from hutch.services.api.app import SERVICE

if __name__ == "__main__":
    main(SERVICE)
