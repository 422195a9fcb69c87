package apply

// StatementTimeout exposes statementTimeout to the external tests.
var StatementTimeout = statementTimeout
