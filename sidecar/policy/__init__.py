"""The approval policy (`SIDECAR_POLICY_FILE`): named rules read from YAML, matched against what a
permission request or an egress request would do, deciding it before a person is asked."""
