"""The api image's service: run status and each source repository's results page over HTTP (FastAPI),
read from the queue database, read-only (app: the routes; pages: the HTML and its SVG chart)."""
