"""Plain helpers the tests import (``tests.helpers.data``, ``tests.helpers.files``); fixtures live in conftest.py files."""
