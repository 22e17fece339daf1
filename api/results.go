package api

import "encoding/base64"

// ResultsPrefix starts the subjects on which the throttler publishes the
// settled records of a lane that keeps results (core NATS):
// throttler.results.<lane>.<token>. A NATS publisher subscribes to its
// job's subject, or to throttler.results.<lane>.>, before it publishes.
const ResultsPrefix = "throttler.results."

// ResultsSubject is the subject job id's settled record of lane is
// published on: ResultsPrefix + lane + "." + SubjectToken(id).
func ResultsSubject(lane, id string) string { return ResultsPrefix + lane + "." + SubjectToken(id) }

// encodedToken starts the token of an id that is not a token by itself.
const encodedToken = "~"

// SubjectToken is job id as one NATS subject token: the id itself when it
// is made of letters, digits, '-' and '_' only; otherwise '~' followed by
// the id in unpadded base64url (RFC 4648 §5). The two forms never meet:
// '~' is not in the first one's alphabet, so two ids never share a token.
func SubjectToken(id string) string {
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return encodedToken + base64.RawURLEncoding.EncodeToString([]byte(id))
		}
	}
	if id == "" {
		return encodedToken
	}
	return id
}
