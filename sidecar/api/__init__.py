"""The HTTP API: routes, the dashboard, `/terminal`, the OpenAPI document and `/metrics`."""
