"""The audit trail: what was asked, decided and reached, appended as JSON lines that a crash does
not lose once acknowledged (`trail`), its schema (`records`) and its reader (`reader`)."""
