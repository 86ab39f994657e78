"""Published versions: locking, publishing, retention, thin versions and export, verify, reports."""
