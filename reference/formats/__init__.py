"""The reference's files: scenarios, scheduler traces and their schemas, the settings
table a trace header is checked against, and the deployment rows the shipped traces
stand for."""
