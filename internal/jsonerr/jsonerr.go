// Package jsonerr says what is wrong with JSON that others wrote (a file
// in a shared directory, an entry in Redis, an admin request) without
// repeating the data, which may hold a client key or a secret.
package jsonerr

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Describe describes a JSON decoding error without the data it is about.
func Describe(err error) string {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return "malformed JSON: it ends early"
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return strings.TrimPrefix(err.Error(), "json: ")
	case errors.As(err, &syntax):
		return fmt.Sprintf("malformed JSON at byte %d", syntax.Offset)
	case errors.As(err, &typ):
		return fmt.Sprintf("field %s: want a %s", typ.Field, typ.Type)
	}
	return "not a JSON object"
}
