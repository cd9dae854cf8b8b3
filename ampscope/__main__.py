import sys

try:
    from ampscope.cli.main import main
except KeyboardInterrupt:  # Ctrl+C while Python imports ampscope: no traceback
    print("ampscope: stopped (Ctrl+C).", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
