"""``ampscope serve``, the dashboard served to browsers, and the viewer each browser tab gets.

serve.py          ``ampscope serve``: the server, its viewer limit and its websocket checks
messages.py       what a browser tab may send, checked before a viewer sees it
page.py           the page browsers get, made to work offline
viewers.py        the viewer processes behind the server: one per tab, each with a bounded life
viewer.py         ``python -m ampscope.cli.serve.viewer``: one tab's viewer
viewer_driver.py  the viewer's driver, for a browser that may send anything
viewer_exit.py    how a viewer leaves once ``ampscope serve`` is gone
"""
