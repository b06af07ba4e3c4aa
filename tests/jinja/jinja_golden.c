/* jinja_golden.c — renders every template x conversation of a golden file made by
 * tests/jinja/golden.py (Python's jinja2 with transformers' settings) with comet's Jinja
 * interpreter and compares byte for byte. A case jinja2 could not render must fail in
 * comet too. Templates jinja2 cannot compile are skipped (reported).
 *
 * Usage: jinja_golden GOLDEN.json CONVERSATIONS.json TEMPLATE_DIR [EXCEPTION ...]
 * Each EXCEPTION names a template file whose mismatches are reported but not counted.
 * Exit status: 0 when every other case matches, 1 otherwise, 2 on bad input.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "comet/status.h"
#include "tokenizer/jinja.h"

static char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)len + 1);
    if (s && fread(s, 1, (size_t)len, f) != (size_t)len) {
        free(s);
        s = NULL;
    }
    fclose(f);
    if (s) {
        s[len] = '\0';
        *n = (size_t)len;
    }
    return s;
}

static void show_diff(const char *want, const char *got) {
    size_t i = 0;
    while (want[i] && want[i] == got[i])
        i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "      first difference at byte %zu\n      want: \"", i);
    for (size_t k = from; want[k] && k < i + 60; k++)
        fputs(want[k] == '\n' ? "\\n" : (char[]){want[k], 0}, stderr);
    fprintf(stderr, "\"\n      got:  \"");
    for (size_t k = from; got[k] && k < i + 60; k++)
        fputs(got[k] == '\n' ? "\\n" : (char[]){got[k], 0}, stderr);
    fprintf(stderr, "\"\n");
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s GOLDEN.json CONVERSATIONS.json TEMPLATE_DIR [EXCEPTION ...]\n",
                argv[0]);
        return 2;
    }
    size_t n;
    char *gs = read_file(argv[1], &n), *cs = read_file(argv[2], &n);
    cJSON *golden = gs ? cJSON_Parse(gs) : NULL, *convs = cs ? cJSON_Parse(cs) : NULL;
    if (!golden || !convs) {
        fprintf(stderr, "jinja_golden: cannot read %s or %s\n", argv[1], argv[2]);
        return 2;
    }
    comet_jinja_params p = comet_jinja_default_params();
    p.now = (time_t)cJSON_GetObjectItem(golden, "now")->valuedouble;
    p.utc = 1;
    int n_templates = 0, n_pass = 0, n_cases = 0, n_case_ok = 0, n_fail_counted = 0, n_skip = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItem(golden, "templates")) {
        const char *name = cJSON_GetObjectItem(t, "name")->valuestring;
        int excepted = 0;
        for (int i = 4; i < argc; i++)
            excepted |= !strcmp(argv[i], name);
        if (cJSON_GetObjectItem(t, "compile_error")) {
            printf("SKIP %s: jinja2 cannot compile it (%s)\n", name,
                   cJSON_GetObjectItem(t, "compile_error")->valuestring);
            n_skip++;
            continue;
        }
        n_templates++;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[3], name);
        size_t src_n;
        char *src = read_file(path, &src_n);
        if (!src) {
            fprintf(stderr, "jinja_golden: cannot read %s\n", path);
            return 2;
        }
        comet_jinja *tmpl = comet_jinja_parse(src, src_n);
        free(src);
        int bad = 0, total = 0;
        const cJSON *cse;
        cJSON_ArrayForEach(cse, cJSON_GetObjectItem(t, "cases")) {
            total++;
            int ci = cJSON_GetObjectItem(cse, "conv")->valueint;
            int gen = cJSON_IsTrue(cJSON_GetObjectItem(cse, "gen"));
            const cJSON *want = cJSON_GetObjectItem(cse, "text");
            const cJSON *conv = cJSON_GetArrayItem(convs, ci);
            char *out = NULL;
            size_t out_n = 0;
            comet_status st = COMET_ERR_INVALID_ARG;
            char why[600] = "";
            if (tmpl) {
                cJSON *data = cJSON_CreateObject(), *trusted = cJSON_CreateObject();
                cJSON_AddItemToObject(data, "messages",
                                      cJSON_Duplicate(cJSON_GetObjectItem(conv, "messages"), 1));
                const cJSON *tools = cJSON_GetObjectItem(conv, "tools");
                cJSON_AddItemToObject(data, "tools",
                                      tools ? cJSON_Duplicate(tools, 1) : cJSON_CreateNull());
                cJSON_AddNullToObject(data, "documents");
                cJSON_AddBoolToObject(trusted, "add_generation_prompt", gen);
                cJSON_AddStringToObject(trusted, "bos_token", "<s>");
                cJSON_AddStringToObject(trusted, "eos_token", "</s>");
                st = comet_jinja_render(tmpl, data, trusted, &p, &out, &out_n, NULL);
                if (st < 0)
                    snprintf(why, sizeof why, "%s", comet_last_error());
                cJSON_Delete(data);
                cJSON_Delete(trusted);
            } else
                snprintf(why, sizeof why, "%s", comet_last_error());
            int ok;
            if (want)
                ok = st == COMET_OK && out_n == strlen(want->valuestring) &&
                     !memcmp(out, want->valuestring, out_n);
            else
                ok = st < 0;
            n_cases++;
            n_case_ok += ok;
            if (!ok) {
                bad++;
                if (bad <= 2) {
                    fprintf(stderr, "  %s%s conv %d gen %d: ", excepted ? "(exception) " : "",
                            name, ci, gen);
                    if (!want)
                        fprintf(stderr, "jinja2 fails (%s) but comet renders\n",
                                cJSON_GetObjectItem(cse, "error")->valuestring);
                    else if (st < 0)
                        fprintf(stderr, "comet fails: %s\n", why);
                    else {
                        fprintf(stderr, "output differs\n");
                        show_diff(want->valuestring, out);
                    }
                }
            }
            free(out);
        }
        comet_jinja_free(tmpl);
        printf("%s %s: %d/%d cases\n", bad ? (excepted ? "EXCEPTED" : "FAIL") : "PASS", name,
               total - bad, total);
        if (!bad)
            n_pass++;
        else if (!excepted)
            n_fail_counted++;
    }
    printf("%d/%d templates byte-identical (%d/%d cases); %d not compiled by jinja2; %d "
           "failing outside the exceptions\n",
           n_pass, n_templates, n_case_ok, n_cases, n_skip, n_fail_counted);
    cJSON_Delete(golden);
    cJSON_Delete(convs);
    free(gs);
    free(cs);
    return n_fail_counted ? 1 : 0;
}
