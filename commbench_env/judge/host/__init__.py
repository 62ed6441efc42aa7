"""The judge as the host sees it: the request it sends, the result it reads back, the client that carries both
across the sandbox wall, and the feedback text an agent reads. Nothing here runs inside a sandbox or near
candidate code; it is torch-free."""
