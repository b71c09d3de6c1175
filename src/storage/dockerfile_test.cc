#include "storage/dockerfile.h"

#include <gtest/gtest.h>

namespace sbx::storage {
namespace {

using K = BuildStep::Kind;
using Args = std::vector<std::string>;

std::vector<BuildStep> Parse(const std::string& text,
                             const std::map<std::string, std::string>& args = {}) {
  auto r = ParseDockerfile(text, args);
  EXPECT_TRUE(r.ok()) << r.status().message() << "\n" << text;
  return r.ok() ? *r : std::vector<BuildStep>{};
}

std::string Error(const std::string& text, const std::map<std::string, std::string>& args = {}) {
  auto r = ParseDockerfile(text, args);
  EXPECT_FALSE(r.ok()) << text;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().err(), EINVAL) << r.status().message();
  return r.status().what();
}

TEST(DockerfileTest, EveryInstruction) {
  auto s = Parse(
      "FROM host\n"
      "RUN echo hi > /tmp/x\n"
      "RUN [\"/bin/echo\", \"a b\"]\n"
      "COPY a.txt /app/\n"
      "ADD b.txt c.txt /app/\n"
      "ENV A=1 B=\"two words\"\n"
      "ARG V=3\n"
      "WORKDIR /app\n"
      "USER user:users\n"
      "LABEL org.x=y\n"
      "EXPOSE 8080 53/udp\n"
      "CMD [\"python3\", \"-m\", \"http.server\"]\n"
      "ENTRYPOINT exec /bin/sh\n");
  ASSERT_EQ(s.size(), 13u);
  EXPECT_EQ(s[0].kind, K::kFrom);
  EXPECT_EQ(s[0].args, Args{"host"});
  EXPECT_EQ(s[0].line, 1);
  EXPECT_EQ(s[1].kind, K::kRun);
  EXPECT_FALSE(s[1].exec_form);
  EXPECT_EQ(s[1].args, Args{"echo hi > /tmp/x"});
  EXPECT_EQ(s[1].text, "RUN echo hi > /tmp/x");
  EXPECT_TRUE(s[2].exec_form);
  EXPECT_EQ(s[2].args, (Args{"/bin/echo", "a b"}));
  EXPECT_EQ(s[3].kind, K::kCopy);
  EXPECT_EQ(s[3].args, (Args{"a.txt", "/app/"}));
  EXPECT_EQ(s[4].kind, K::kCopy);
  EXPECT_EQ(s[4].args, (Args{"b.txt", "c.txt", "/app/"}));
  EXPECT_EQ(s[4].text.substr(0, 3), "ADD");
  EXPECT_EQ(s[5].kind, K::kEnv);
  EXPECT_EQ(s[5].args, (Args{"A", "1", "B", "two words"}));
  EXPECT_EQ(s[6].kind, K::kArg);
  EXPECT_EQ(s[6].args, (Args{"V", "3"}));
  EXPECT_EQ(s[7].kind, K::kWorkdir);
  EXPECT_EQ(s[7].args, Args{"/app"});
  EXPECT_EQ(s[8].kind, K::kUser);
  EXPECT_EQ(s[8].args, Args{"user:users"});
  EXPECT_EQ(s[9].kind, K::kLabel);
  EXPECT_EQ(s[9].args, (Args{"org.x", "y"}));
  EXPECT_EQ(s[10].kind, K::kExpose);
  EXPECT_EQ(s[10].args, (Args{"8080/tcp", "53/udp"}));
  EXPECT_EQ(s[11].kind, K::kCmd);
  EXPECT_TRUE(s[11].exec_form);
  EXPECT_EQ(s[11].args, (Args{"python3", "-m", "http.server"}));
  EXPECT_EQ(s[12].kind, K::kEntrypoint);
  EXPECT_FALSE(s[12].exec_form);
  EXPECT_EQ(s[12].args, Args{"exec /bin/sh"});
  EXPECT_EQ(s[12].line, 13);
}

TEST(DockerfileTest, KeywordsAnyCaseAndFromAs) {
  auto s = Parse("from debian:12 as base\nrun true\n");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].args, Args{"debian:12"});
  EXPECT_EQ(s[1].kind, K::kRun);
}

TEST(DockerfileTest, ContinuationsCommentsAndBlankLines) {
  auto s = Parse(
      "# a comment\n"
      "\n"
      "FROM host\n"
      "RUN apt-get update && \\\n"
      "    # a comment inside the continuation\n"
      "\n"
      "    apt-get install -y git \\   \n"
      "    curl\n"
      "   # indented comment\n"
      "ENV X=1\r\n");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[1].line, 4);
  EXPECT_EQ(s[1].args, Args{"apt-get update &&     apt-get install -y git     curl"});
  EXPECT_EQ(s[2].line, 10);
  EXPECT_EQ(s[2].args, (Args{"X", "1"}));
}

TEST(DockerfileTest, ParserDirectives) {
  // `syntax` is ignored; `escape` changes the continuation character.
  auto s = Parse(
      "# syntax=docker/dockerfile:1\n# escape=`\nFROM host\nRUN echo a `\n  b\nCOPY a\\b /x\n");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[1].args, Args{"echo a   b"});
  EXPECT_EQ(s[2].args, (Args{"a\\b", "/x"}));
  // After the first instruction a directive is a comment.
  s = Parse("FROM host\n# escape=`\nRUN a \\\n b\n");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[1].args, Args{"a  b"});
}

TEST(DockerfileTest, ExecFormFallsBackToShellForm) {
  auto s = Parse(
      "FROM host\nRUN [\"unterminated\nCMD [\"a\", 1]\nCMD [\"\\u00e9\\ud83d\\ude00\", "
      "\"q\\\"\"]\nCMD []\n");
  ASSERT_EQ(s.size(), 5u);
  EXPECT_FALSE(s[1].exec_form);
  EXPECT_EQ(s[1].args, Args{"[\"unterminated"});
  EXPECT_FALSE(s[2].exec_form);
  EXPECT_TRUE(s[3].exec_form);
  EXPECT_EQ(s[3].args, (Args{"\xc3\xa9\xf0\x9f\x98\x80", "q\""}));
  EXPECT_TRUE(s[4].exec_form);
  EXPECT_TRUE(s[4].args.empty());
}

TEST(DockerfileTest, Substitution) {
  auto s = Parse(
      "ARG BASE=host\n"
      "FROM $BASE\n"
      "ARG BASE\n"
      "ARG DIR=/srv\n"
      "ENV HOME_DIR=${DIR}/home NAME=app\n"
      "WORKDIR $HOME_DIR/${NAME}\n"
      "WORKDIR sub/../data\n"
      "ENV G=${UNSET:-fallback} H=${NAME:+set} I=${UNSET:+x}x J='$NAME' K=\"$NAME\" L=\\$NAME\n"
      "LABEL base=$BASE\n"
      "USER ${NAME}\n"
      "COPY ${NAME}.conf $HOME_DIR/\n"
      "RUN echo $NAME\n"
      "EXPOSE ${PORT:-9000}\n");
  ASSERT_EQ(s.size(), 12u);
  EXPECT_EQ(s[0].args, Args{"host"});
  EXPECT_EQ(s[1].args, (Args{"BASE", "host"}));  // the default of the ARG before FROM
  EXPECT_EQ(s[3].args, (Args{"HOME_DIR", "/srv/home", "NAME", "app"}));
  EXPECT_EQ(s[4].args, Args{"/srv/home/app"});
  EXPECT_EQ(s[5].args, Args{"/srv/home/app/data"});  // relative to the previous WORKDIR
  EXPECT_EQ(s[6].args,
            (Args{"G", "fallback", "H", "set", "I", "x", "J", "$NAME", "K", "app", "L", "$NAME"}));
  EXPECT_EQ(s[7].args, (Args{"base", "host"}));
  EXPECT_EQ(s[8].args, Args{"app"});
  EXPECT_EQ(s[9].args, (Args{"app.conf", "/srv/home/"}));
  EXPECT_EQ(s[10].args, Args{"echo $NAME"});  // the shell substitutes, not the parser
  EXPECT_EQ(s[11].args, Args{"9000/tcp"});
}

TEST(DockerfileTest, BuildArgsOverrideDefaultsAndEnvWinsOverArg) {
  auto s =
      Parse("ARG TAG=1\nFROM base:$TAG\nARG V=default\nARG W\nENV V=env\nENV X=$V Y=${W:-none}\n",
            {{"TAG", "2"}, {"V", "cli"}});
  ASSERT_EQ(s.size(), 5u);
  EXPECT_EQ(s[0].args, Args{"base:2"});
  EXPECT_EQ(s[1].args, (Args{"V", "cli"}));
  EXPECT_EQ(s[2].args, (Args{"W", ""}));
  EXPECT_EQ(s[4].args, (Args{"X", "env", "Y", "none"}));
  // An ENV applies from the next instruction on: both see the old value.
  s = Parse("FROM host\nENV A=1\nENV A=2 B=$A\n");
  EXPECT_EQ(s[2].args, (Args{"A", "2", "B", "1"}));
}

TEST(DockerfileTest, LegacyEnvForm) {
  auto s = Parse("FROM host\nENV GREETING hello   world\nLABEL desc a \"quoted\" thing\n");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[1].args, (Args{"GREETING", "hello   world"}));
  EXPECT_EQ(s[2].args, (Args{"desc", "a quoted thing"}));
}

TEST(DockerfileTest, CopyFlagsAndJsonForm) {
  auto s = Parse("FROM host\nARG U=user\nCOPY --chown=$U:users --link [\"a b.txt\", \"/dst/\"]\n");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[2].chown, "user:users");
  EXPECT_EQ(s[2].args, (Args{"a b.txt", "/dst/"}));
}

TEST(DockerfileTest, ErrorsNameTheLine) {
  EXPECT_EQ(Error("FROM host\nRUN true\n\n\n\n\nHEALTHCHECK CMD true\n"),
            "Dockerfile line 7: HEALTHCHECK is not supported by sbx build");
  for (const char* kw : {"ONBUILD RUN x", "VOLUME /data", "SHELL [\"/bin/bash\"]", "STOPSIGNAL 9",
                         "MAINTAINER me"}) {
    std::string e = Error(std::string("FROM host\n") + kw + "\n");
    EXPECT_EQ(e.rfind("Dockerfile line 2: ", 0), 0u) << e;
    EXPECT_NE(e.find("is not supported by sbx build"), std::string::npos) << e;
  }
  EXPECT_EQ(Error("FROM host\nFROBNICATE x\n"),
            "Dockerfile line 2: unknown instruction FROBNICATE");
  EXPECT_EQ(Error("FROM a\nRUN x\nFROM b\n"),
            "Dockerfile line 3: a second FROM (multi-stage builds) is not supported by sbx build");
  EXPECT_EQ(Error("FROM a\nCOPY --from=build /x /y\n"),
            "Dockerfile line 2: COPY --from (multi-stage builds) is not supported by sbx build");
  EXPECT_EQ(
      Error("FROM a\nADD https://example.com/x.tgz /x\n"),
      "Dockerfile line 2: ADD of a URL is not supported by sbx build (fetch it in a RUN step)");
  EXPECT_EQ(Error("FROM a\nRUN <<EOF\necho hi\nEOF\n"),
            "Dockerfile line 2: heredocs (<<EOF) are not supported by sbx build");
  EXPECT_EQ(Error("FROM a\nRUN --mount=type=cache,target=/x true\n"),
            "Dockerfile line 2: RUN --mount is not supported by sbx build");
  EXPECT_EQ(Error("RUN true\n"),
            "Dockerfile line 1: the first instruction (after ARGs) must be FROM, not RUN");
  EXPECT_EQ(Error("# only a comment\n"), "Dockerfile: no FROM instruction");
  EXPECT_EQ(Error(""), "Dockerfile: no FROM instruction");
  EXPECT_EQ(Error("FROM a\nCOPY onlyone\n"),
            "Dockerfile line 2: COPY requires a source and a destination");
  EXPECT_EQ(Error("FROM a\nCOPY a b /notadir\n"),
            "Dockerfile line 2: COPY with more than one source needs a destination directory "
            "ending in /");
  EXPECT_EQ(Error("FROM a\nCOPY --chmod=755 a /b\n"),
            "Dockerfile line 2: COPY --chmod is not supported by sbx build");
  EXPECT_EQ(Error("FROM a\nENV A=1 B\n"), "Dockerfile line 2: ENV: 'B' is not NAME=VALUE");
  EXPECT_EQ(Error("FROM a\nENV ONLYNAME\n"),
            "Dockerfile line 2: ENV ONLYNAME needs a value (NAME=VALUE)");
  EXPECT_EQ(Error("FROM a\nENV =x\n"), "Dockerfile line 2: ENV: a name is required before '='");
  EXPECT_EQ(Error("FROM a\nEXPOSE 99999\n"),
            "Dockerfile line 2: EXPOSE 99999: not a port or range of ports");
  EXPECT_EQ(Error("FROM a\nEXPOSE 80/icmp\n"),
            "Dockerfile line 2: EXPOSE 80/icmp: the protocol must be tcp, udp or sctp");
  EXPECT_EQ(Error("FROM a\nUSER a b\n"),
            "Dockerfile line 2: USER takes one user (USER NAME[:GROUP])");
  EXPECT_EQ(Error("FROM a\nRUN\n"), "Dockerfile line 2: RUN requires at least one argument");
  EXPECT_EQ(Error("FROM a\nENV A=${B:-x\n"), "Dockerfile line 2: missing '}'");
  EXPECT_EQ(Error("FROM a\nENV A=${B\n"), "Dockerfile line 2: bad substitution");
  EXPECT_EQ(Error("FROM a\nENV A=\"${B:?must be set}\"\n"), "Dockerfile line 2: B: must be set");
  EXPECT_EQ(Error("FROM a\nENV A=${B*}\n"), "Dockerfile line 2: bad substitution");
  EXPECT_EQ(Error("FROM a\nENV A='open\n"), "Dockerfile line 2: unterminated single quote");
  EXPECT_EQ(Error("FROM a b c\n"),
            "Dockerfile line 1: FROM takes one image or template (FROM NAME [AS STAGE])");
  EXPECT_EQ(Error("FROM --platform=linux/arm64 a\n"),
            "Dockerfile line 1: FROM --platform=linux/arm64: sbx builds linux/amd64 only");
  // A line number after a continuation counts physical lines.
  EXPECT_EQ(Error("FROM a\nRUN a \\\n b\nVOLUME /x\n").rfind("Dockerfile line 4: ", 0), 0u);
}

TEST(DockerfileTest, ExpansionIsBounded) {
  std::string text =
      "FROM a\nENV A=xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n";
  for (int i = 0; i < 40; ++i) text += "ENV A=$A$A\n";
  std::string e = Error(text);
  EXPECT_NE(e.find("too large after variable substitution"), std::string::npos) << e;
  std::string deep = "FROM a\nENV A=";
  for (int i = 0; i < 100; ++i) deep += "${X:-";
  EXPECT_NE(Error(deep + "\n").find("nested too deeply"), std::string::npos);
  EXPECT_EQ(Error(std::string("FROM a\nRUN a\0b\n", 14)), "Dockerfile: contains a NUL byte");
}

TEST(IgnoreRules, FollowsDockersMatching) {
  auto r = IgnoreRules::Parse(
      "# comment\n\n  *.tmp  \n/build\n**/cache\nsecret?.txt\ndocs\n!docs/keep.md\n"
      "a/**/z\n./x/../y\n");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->HasExceptions());
  EXPECT_TRUE(r->Excluded("f.tmp"));
  EXPECT_FALSE(r->Excluded("d/f.tmp"));  // `*` stays within one component, at the root
  EXPECT_TRUE(r->Excluded("build"));
  EXPECT_TRUE(r->Excluded("build/out/bin"));  // a parent directory matches
  EXPECT_TRUE(r->Excluded("/build"));
  EXPECT_TRUE(r->Excluded("./build"));
  EXPECT_FALSE(r->Excluded("src/build"));
  EXPECT_TRUE(r->Excluded("cache"));
  EXPECT_TRUE(r->Excluded("p/q/cache/f"));
  EXPECT_TRUE(r->Excluded("secret1.txt"));
  EXPECT_FALSE(r->Excluded("secret12.txt"));
  EXPECT_TRUE(r->Excluded("docs/other.md"));
  EXPECT_FALSE(r->Excluded("docs/keep.md"));
  EXPECT_TRUE(r->Excluded("a/z"));
  EXPECT_TRUE(r->Excluded("a/b/c/z/f"));
  EXPECT_FALSE(r->Excluded("b/a/z"));
  EXPECT_TRUE(r->Excluded("y"));
  EXPECT_FALSE(r->Excluded("x"));
  EXPECT_FALSE(r->Excluded("main.c"));
}

TEST(IgnoreRules, TheLastMatchingPatternDecides) {
  auto r = IgnoreRules::Parse("*.md\n!README.md\nREADME.md\n!*/\\*.md\n");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->Excluded("README.md"));
  EXPECT_TRUE(r->Excluded("CHANGES.md"));
  EXPECT_TRUE(r->Excluded("d/*.md") == false);  // `\*` is a literal star
  auto empty = IgnoreRules::Parse("");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  EXPECT_FALSE(empty->Excluded("anything"));
}

TEST(IgnoreRules, ManyGlobstarsStayPolynomialAndBoundsHold) {
  std::string pat;
  for (int i = 0; i < 30; ++i) pat += "**/a/";
  pat += "b";
  auto r = IgnoreRules::Parse(pat);
  ASSERT_TRUE(r.ok());
  std::string path;
  for (int i = 0; i < 60; ++i) path += "a/";
  EXPECT_FALSE(r->Excluded(path + "c"));
  EXPECT_TRUE(r->Excluded(path + "b"));
  EXPECT_EQ(IgnoreRules::Parse(std::string((1 << 20) + 1, 'x')).status().err(), EINVAL);
  std::string many;
  for (int i = 0; i < 10001; ++i) many += "p" + std::to_string(i) + "\n";
  auto too_many = IgnoreRules::Parse(many);
  EXPECT_EQ(too_many.status().err(), EINVAL);
  EXPECT_NE(too_many.status().what().find("line 10001"), std::string::npos);
}

}  // namespace
}  // namespace sbx::storage
