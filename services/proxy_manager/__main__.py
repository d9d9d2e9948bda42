"""Start the proxy-manager service: `python -m hutch.services.proxy_manager` (or `hutch serve proxy-manager`)."""

from hutch.service import main
from hutch.services.proxy_manager.app import SERVICE

if __name__ == "__main__":
    main(SERVICE)
