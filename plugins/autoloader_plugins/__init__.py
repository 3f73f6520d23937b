"""First-party dataset plugins, registered through the ``autoloader.datasets`` group."""
