package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
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

// OpenAI error codes the router answers with.
const (
	codeModelNotFound = "model_not_found"
	codeInvalidAPIKey = "invalid_api_key"
	codeRateLimited   = "rate_limit_exceeded"
)

// errorJSON is the OpenAI-shaped error body; typ "" picks the type from
// the status and code "" sends a null code.
func errorJSON(status int, typ, code, msg string) []byte {
	if typ == "" {
		typ = "invalid_request_error"
		if status >= 500 {
			typ = "server_error"
		}
	}
	body := apiErrorBody{Message: msg, Type: typ}
	if code != "" {
		body.Code = &code
	}
	b, _ := json.Marshal(apiError{Error: body})
	return append(b, '\n')
}

// writeError answers with an OpenAI-shaped error with a null code and
// returns status, so handlers can `return writeError(...)` into their
// metric label.
func writeError(w http.ResponseWriter, status int, msg string) int {
	return writeErrorCode(w, status, "", "", msg)
}

// writeErrorCode answers with an OpenAI-shaped error of the given type
// ("" for the status's default) and code ("" for null).
func writeErrorCode(w http.ResponseWriter, status int, typ, code, msg string) int {
	b := errorJSON(status, typ, code, msg)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
	return status
}

// writeModelNotFound is OpenAI's answer for a model nobody serves.
func writeModelNotFound(w http.ResponseWriter, model string) int {
	return writeErrorCode(w, http.StatusNotFound, "", codeModelNotFound, fmt.Sprintf("The model '%s' does not exist.", model))
}

// writeRetryLater answers 429 or 503 with Retry-After, the signal OpenAI
// clients (and their SDKs' retry loops) act on.
func writeRetryLater(w http.ResponseWriter, status int, after time.Duration, msg string) int {
	secs := max(int((after+time.Second-1)/time.Second), 1)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	if status == http.StatusTooManyRequests {
		return writeErrorCode(w, status, "requests", codeRateLimited, msg)
	}
	return writeErrorCode(w, status, "", "", msg)
}
