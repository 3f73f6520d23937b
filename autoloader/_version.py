__version__ = "0.1.0"
# The name on PyPI: `autoloader` there is an unrelated 2018 package.
DISTRIBUTION = "torch-autoloader"
