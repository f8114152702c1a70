package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// apiError is the OpenAI error envelope clients already know how to read.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// writeError answers with an OpenAI-shaped error and returns status, so
// handlers can `return writeError(...)` into their metric label.
func writeError(w http.ResponseWriter, status int, msg string) int {
	typ := "invalid_request_error"
	if status >= 500 {
		typ = "server_error"
	}
	var code *string
	if status == http.StatusNotFound {
		c := "model_not_found"
		code = &c
	}
	b, _ := json.Marshal(apiError{Error: apiErrorBody{Message: msg, Type: typ, Code: code}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
	return status
}
