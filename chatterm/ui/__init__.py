"""The Textual user interface of `chatterm launch`.

It shows and drives the headless core (`chatterm.core`): a `Conversation` on an
`Engine`, the session store and the export. It never computes a metric itself;
figures come from `TurnMetrics` / `SessionSummary` and are worded by
`chatterm.core.metrics.format`. Build the app with `chatterm.ui.launch.make_app`, the one
factory the CLI and the tests share. Importing this package loads no model.
"""
