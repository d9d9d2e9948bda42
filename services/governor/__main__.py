"""Start the governor service: `python -m hutch.services.governor` (or `hutch serve governor`)."""

from hutch.service import main
from hutch.services.governor.app import SERVICE

if __name__ == "__main__":
    main(SERVICE)
