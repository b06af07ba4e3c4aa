/* test_texts.c — checks the evaluation texts that scripts/extract_texts.py writes into data/
 * (Jane Austen's six novels from r-cran-janeaustenr, Moby Dick from r-cran-tokenizers):
 * each file exists, has a plausible size, begins with the book's known opening, contains a
 * known sentence, is valid UTF-8 with "\n" line ends and no byte-order mark, and
 * data/austen_all.txt is exactly the six novels concatenated in order.
 * scripts/setup.sh creates data/ before tests run, so a missing file is a failure. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

typedef struct {
    const char *path; /* relative to $COMET_SOURCE_DIR */
    long min_bytes;   /* plausible size range */
    long max_bytes;
    const char *opening;  /* the file starts with this */
    const char *sentence; /* and contains this somewhere */
} text_spec;

/* Sizes: the janeaustenr 1.0.0 / tokenizers 0.3.0 texts are 430 KB - 1.3 MB each; the ranges
 * leave room for other package versions but catch truncation or a wrong object. */
static const text_spec novels[] = {
    {"data/austen/sensesensibility.txt", 500000, 900000, "SENSE AND SENSIBILITY\n",
     "The family of Dashwood had long been settled in Sussex."},
    {"data/austen/prideprejudice.txt", 500000, 900000, "PRIDE AND PREJUDICE\n\nBy Jane Austen\n",
     "It is a truth universally acknowledged, that a single man in possession\nof a good fortune, "
     "must be in want of a wife."},
    {"data/austen/mansfieldpark.txt", 700000, 1100000, "MANSFIELD PARK\n",
     "About thirty years ago Miss Maria Ward, of Huntingdon, with only seven\nthousand pounds"},
    {"data/austen/emma.txt", 700000, 1100000, "EMMA\n",
     "Emma Woodhouse, handsome, clever, and rich, with a comfortable home\nand happy disposition"},
    {"data/austen/northangerabbey.txt", 300000, 600000, "NORTHANGER ABBEY\n",
     "No one who had ever seen Catherine Morland in her infancy would have\nsupposed her born to "
     "be an heroine."},
    {"data/austen/persuasion.txt", 350000, 650000, "Persuasion\n",
     "Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who,\nfor his own "
     "amusement, never took up any book but the Baronetage"},
};

static const text_spec mobydick = {
    "data/mobydick.txt", 1000000, 1500000,
    "The Project Gutenberg EBook of Moby Dick; or The Whale, by Herman Melville",
    "Call me Ishmael."};

typedef struct {
    char *data;
    long len;
} text_file;

static text_file load(const char *rel) {
    const char *root = getenv("COMET_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root && root[0] ? root : ".", rel);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("%s is missing: run `bash scripts/setup.sh` (or scripts/extract_texts.py)", path);
    text_file t = {0};
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    t.len = ftell(f);
    assert_true(t.len >= 0);
    rewind(f);
    t.data = malloc((size_t)t.len + 1);
    assert_non_null(t.data);
    assert_int_equal(fread(t.data, 1, (size_t)t.len, f), (size_t)t.len);
    t.data[t.len] = '\0';
    fclose(f);
    return t;
}

/* Returns 1 when s[0..n) is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
static int valid_utf8(const unsigned char *s, long n) {
    long i = 0;
    while (i < n) {
        unsigned c = s[i];
        int extra;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            extra = 1, cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            extra = 2, cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            extra = 3, cp = c & 0x07;
        } else {
            return 0;
        }
        for (int k = 1; k <= extra; k++) {
            if (i + k >= n || (s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((extra == 1 && cp < 0x80) || (extra == 2 && cp < 0x800) ||
            (extra == 3 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += extra + 1;
    }
    return 1;
}

static void check_text(const text_spec *spec, text_file *out) {
    text_file t = load(spec->path);
    if (t.len < spec->min_bytes || t.len > spec->max_bytes)
        fail_msg("%s: %ld bytes, expected %ld..%ld", spec->path, t.len, spec->min_bytes,
                 spec->max_bytes);
    if (strncmp(t.data, spec->opening, strlen(spec->opening)) != 0)
        fail_msg("%s does not start with \"%s\"", spec->path, spec->opening);
    if (!strstr(t.data, spec->sentence))
        fail_msg("%s lacks \"%s\"", spec->path, spec->sentence);
    assert_null(memchr(t.data, '\r', (size_t)t.len));
    assert_null(memchr(t.data, '\0', (size_t)t.len));
    assert_true(t.len > 0 && t.data[t.len - 1] == '\n');
    if (!valid_utf8((const unsigned char *)t.data, t.len))
        fail_msg("%s is not valid UTF-8", spec->path);
    if (out)
        *out = t;
    else
        free(t.data);
}

static void test_austen_novels(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof novels / sizeof novels[0]; i++)
        check_text(&novels[i], NULL);
}

/* Pride and Prejudice opens with its title, author, chapter heading, then the famous line. */
static void test_pride_and_prejudice_opening(void **state) {
    (void)state;
    text_file t = load("data/austen/prideprejudice.txt");
    const char *expect = "PRIDE AND PREJUDICE\n\nBy Jane Austen\n\n\n\nChapter 1\n\n\n"
                         "It is a truth universally acknowledged, that a single man in "
                         "possession\nof a good fortune, must be in want of a wife.\n";
    assert_true(t.len > (long)strlen(expect));
    assert_memory_equal(t.data, expect, strlen(expect));
    /* the novel ends with its last sentence, not mid-book */
    assert_non_null(strstr(t.data, "had been the means of uniting them."));
    free(t.data);
}

static void test_austen_all_is_concatenation(void **state) {
    (void)state;
    text_file all = load("data/austen_all.txt");
    /* order of extract_texts.py: P&P, S&S, Mansfield Park, Emma, Northanger Abbey, Persuasion */
    static const int order[] = {1, 0, 2, 3, 4, 5};
    long pos = 0;
    for (size_t i = 0; i < 6; i++) {
        text_file t = load(novels[order[i]].path);
        if (pos + t.len > all.len || memcmp(all.data + pos, t.data, (size_t)t.len) != 0)
            fail_msg("data/austen_all.txt: %s not found at offset %ld", novels[order[i]].path, pos);
        pos += t.len;
        free(t.data);
    }
    assert_int_equal(pos, all.len);
    free(all.data);
}

static void test_mobydick(void **state) {
    (void)state;
    text_file t;
    check_text(&mobydick, &t);
    assert_false((unsigned char)t.data[0] == 0xEF); /* no UTF-8 byte-order mark */
    assert_non_null(strstr(t.data, "CHAPTER 1. Loomings."));
    free(t.data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_austen_novels),
        cmocka_unit_test(test_pride_and_prejudice_opening),
        cmocka_unit_test(test_austen_all_is_concatenation),
        cmocka_unit_test(test_mobydick),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
