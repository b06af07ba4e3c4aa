/* comet/utf8.h — UTF-8 validation (RFC 3629), used wherever user text enters the engine. */
#ifndef COMET_UTF8_H
#define COMET_UTF8_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Length in bytes of the longest prefix of s[0..len) that is valid UTF-8 (RFC 3629: no
 * overlongs, no surrogates, at most U+10FFFF). The whole string is valid when the result
 * == len. `s` is borrowed and need not be NUL-terminated. */
size_t comet_utf8_valid_prefix(const char *s, size_t len);

#ifdef __cplusplus
}
#endif
#endif
