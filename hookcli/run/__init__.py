"""(package docstring to write)"""
