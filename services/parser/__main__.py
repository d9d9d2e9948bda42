"""Start the parser service: `python -m hutch.services.parser` (or `hutch serve parser`)."""

from hutch.service import main
from hutch.services.parser.app import SERVICE

if __name__ == "__main__":
    main(SERVICE)
