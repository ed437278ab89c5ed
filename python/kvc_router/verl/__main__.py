"""``python -m kvc_router.verl status|install|uninstall``."""

import sys

from .pth import main

sys.exit(main())
