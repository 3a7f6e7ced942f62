"""``python -m hookcli`` runs the command line."""

from hookcli.cli import main

main(prog_name="hookcli")
