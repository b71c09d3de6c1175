// The policy every enforcer decides with: its grammar, its decision order and its JSON shape.
#include "network/policy.h"

#include <gtest/gtest.h>

#include "network/box_net.h"

namespace sbx::network {
namespace {

address A(const char* text) { return boost::asio::ip::make_address(text); }

Rule R(const char* text) {
  Result<Rule> r = ParseRule(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().message();
  return r.ok() ? *r : Rule{};
}

Policy Make(Mode mode, std::vector<const char*> allow, std::vector<const char*> deny = {}) {
  Policy p;
  p.mode = mode;
  for (const char* a : allow) p.allow.push_back(R(a));
  for (const char* d : deny) p.deny.push_back(R(d));
  return p;
}

TEST(PolicyGrammar, EveryFormOfTheHeader) {
  Rule name = R("PyPI.org.");
  EXPECT_EQ(name.kind, Rule::Kind::kName);
  EXPECT_EQ(name.name, "pypi.org");
  EXPECT_EQ(name.port, 0);
  EXPECT_EQ(name.proto, Proto::kTcp);
  EXPECT_EQ(name.text, "pypi.org");

  Rule wild = R("*.pythonhosted.org");
  EXPECT_EQ(wild.kind, Rule::Kind::kWildcard);
  EXPECT_EQ(wild.name, "pythonhosted.org");
  EXPECT_EQ(wild.text, "*.pythonhosted.org");

  EXPECT_EQ(R("*").kind, Rule::Kind::kAnyName);

  Rule cidr = R("140.82.112.0/20");
  EXPECT_EQ(cidr.kind, Rule::Kind::kCidr);
  EXPECT_EQ(cidr.cidr.ToString(), "140.82.112.0/20");
  EXPECT_EQ(R("1.2.3.4").cidr.prefix, 32);
  EXPECT_EQ(R("1.2.3.4").text, "1.2.3.4");
  EXPECT_EQ(R("2001:DB8::1").cidr.prefix, 128);
  EXPECT_EQ(R("2001:db8::/32").text, "2001:db8::/32");

  Rule port = R("pypi.org:443");
  EXPECT_EQ(port.port, 443);
  EXPECT_EQ(port.text, "pypi.org:443");
  EXPECT_EQ(R("*.x.test:8443").port, 8443);
  EXPECT_EQ(R("10.0.0.0/8:22").port, 22);

  Rule v6port = R("[2001:db8::1]:443");
  EXPECT_EQ(v6port.port, 443);
  EXPECT_EQ(v6port.cidr.prefix, 128);
  EXPECT_EQ(v6port.text, "[2001:db8::1]:443");
  EXPECT_EQ(R("[2001:db8::/32]:80").text, "[2001:db8::/32]:80");

  Rule udp = R("198.18.0.0/15:53/udp");
  EXPECT_EQ(udp.proto, Proto::kUdp);
  EXPECT_EQ(udp.port, 53);
  EXPECT_EQ(udp.text, "198.18.0.0/15:53/udp");
  EXPECT_EQ(R("[2001:db8::/32]:53/UDP").text, "[2001:db8::/32]:53/udp");
  // An explicit /tcp is the default spelled out.
  EXPECT_EQ(R("pypi.org:443/tcp").text, "pypi.org:443");

  // The normalised text parses to the same rule: the record round-trips.
  for (const char* t : {"pypi.org", "*.a.b", "*", "1.2.3.0/24:80", "[::ffff:0:0/96]:1",
                        "198.18.0.0/15:53/udp", "[2001:db8::1]:443"}) {
    Rule once = R(t);
    EXPECT_EQ(R(once.text.c_str()).text, once.text) << t;
  }
}

void ExpectBad(const std::string& entry, const std::string& says) {
  Result<Rule> r = ParseRule(entry);
  ASSERT_FALSE(r.ok()) << entry;
  EXPECT_EQ(r.status().err(), EINVAL) << entry;
  EXPECT_NE(r.status().message().find(says), std::string::npos)
      << entry << " -> " << r.status().message();
  // Every message names the entry it is about (bounded for long ones).
  if (!entry.empty() && entry.size() < 64) {
    EXPECT_NE(r.status().message().find("\"" + entry + "\""), std::string::npos)
        << r.status().message();
  }
}

TEST(PolicyGrammar, BadEntriesAreRejectedNamingTheEntry) {
  ExpectBad("", "empty");
  ExpectBad("pypi .org", "white space");
  ExpectBad(" pypi.org", "white space");
  ExpectBad("pypi.org\t", "white space");
  ExpectBad("pypi.org:0", "port");
  ExpectBad("pypi.org:65536", "port");
  ExpectBad("pypi.org:", "port");
  ExpectBad("pypi.org:http", "port");
  ExpectBad("pypi.org:+443", "port");
  ExpectBad("pypi.org:0443", "port");
  ExpectBad("[2001:db8::1]:99999", "port");
  ExpectBad("[2001:db8::1]x", "after ']'");
  ExpectBad("[2001:db8::1", "without ']'");
  ExpectBad("[1.2.3.4]:80", "IPv6 only");
  ExpectBad("198.18.0.0/15/udp", "one port");
  ExpectBad("dns.test:53/udp", "not a name");
  ExpectBad("*:53/udp", "not a name");
  ExpectBad("10.0.0.1/8", "host bits");
  ExpectBad("10.0.0.1/8", "10.0.0.0/8");  // says what was probably meant
  ExpectBad("2001:db8::1/32", "host bits");
  ExpectBad("1.2.3.0/33", "prefix");
  ExpectBad("1.2.3.0/", "prefix");
  ExpectBad("1.2.3.256", "last label is a number");
  ExpectBad("10.1", "last label is a number");
  ExpectBad("fe80::1%eth0", "not an IPv4 or IPv6");
  ExpectBad("a..b", "not a valid name");
  ExpectBad("a,b", "not a valid name");
  ExpectBad("a/b", "not an IPv4");
  ExpectBad("*.", "not a valid name");
  ExpectBad("a.*.b", "'*'");
  ExpectBad("*a.b", "'*'");
  ExpectBad("**.b", "'*'");
  ExpectBad("caf\xc3\xa9.test", "printable ASCII");
  ExpectBad(std::string(64, 'a') + ".test", "not a valid name");  // a label over 63
  std::string long_name;
  for (int i = 0; i < 4; ++i) long_name += std::string(63, 'a') + ".";
  ExpectBad(long_name + "test", "not a valid name");  // over 253 in total
  ExpectBad(std::string(400, 'a'), "longer than 300");
}

TEST(PolicyGrammar, ModesAndCidrs) {
  EXPECT_EQ(*ParseMode("open"), Mode::kOpen);
  EXPECT_EQ(*ParseMode("allowlist"), Mode::kAllowlist);
  EXPECT_EQ(*ParseMode("none"), Mode::kNone);
  EXPECT_FALSE(ParseMode("Open").ok());
  EXPECT_NE(ParseMode("closed").status().message().find("\"closed\""), std::string::npos);
  EXPECT_STREQ(ModeName(Mode::kAllowlist), "allowlist");

  EXPECT_TRUE(ParseCidr("0.0.0.0/0")->Contains(A("8.8.8.8")));
  EXPECT_FALSE(ParseCidr("0.0.0.0/0")->Contains(A("::1")));  // across families: no
  EXPECT_TRUE(ParseCidr("::/0")->Contains(A("2001:db8::1")));
  EXPECT_TRUE(ParseCidr("10.0.0.0/8")->Contains(A("::ffff:10.1.2.3")));
  EXPECT_TRUE(ParseCidr("172.16.0.0/12")->Contains(A("172.31.255.255")));
  EXPECT_FALSE(ParseCidr("172.16.0.0/12")->Contains(A("172.32.0.0")));
  // A v4-mapped range is the IPv4 range it carries.
  Cidr mapped = *ParseCidr("::ffff:10.0.0.0/104");
  EXPECT_TRUE(mapped.base.is_v4());
  EXPECT_EQ(mapped.ToString(), "10.0.0.0/8");
  EXPECT_FALSE(ParseCidr("10.0.0.0/8 ").ok());
  EXPECT_FALSE(ParseCidr("").ok());
}

TEST(PolicyDecide, AlwaysDeniedBeatsAllow) {
  Policy p = Make(Mode::kOpen, {"0.0.0.0/0", "::/0", "*"});
  for (const char* ip : {"0.0.0.0",
                         "127.0.0.1",
                         "10.1.2.3",
                         "100.64.0.1",
                         "169.254.169.254",
                         "172.16.0.1",
                         "192.168.1.1",
                         "192.0.0.8",
                         "224.0.0.251",
                         "239.255.255.250",
                         "240.0.0.1",
                         "255.255.255.255",
                         "::",
                         "::1",
                         "fe80::1",
                         "fc00::1",
                         "fd12:3456::1",
                         "ff02::1",
                         "::ffff:127.0.0.1",
                         "::ffff:10.0.0.1",
                         "::10.0.0.1",
                         "64:ff9b::a00:1",
                         "2002:a00:1::1",
                         "2002:a9fe:a9fe::1"}) {
    Policy::Decision d = p.Decide("pypi.org", A(ip), 443, Proto::kTcp);
    EXPECT_FALSE(d.allowed) << ip;
    EXPECT_TRUE(d.reason.starts_with("always denied")) << ip << ": " << d.reason;
    EXPECT_TRUE(AlwaysDeniedRange(A(ip)).has_value()) << ip;
  }
  EXPECT_EQ(p.Decide(std::nullopt, A("10.9.9.9"), 80, Proto::kTcp).reason,
            "always denied (private range 10.0.0.0/8)");
  EXPECT_EQ(p.Decide(std::nullopt, A("169.254.169.254"), 80, Proto::kTcp).reason,
            "always denied (link-local and metadata range 169.254.0.0/16)");
  EXPECT_EQ(p.Decide(std::nullopt, A("::1"), 80, Proto::kTcp).reason,
            "always denied (loopback address ::1/128)");
  // Public addresses, and the test "internet", are not.
  for (const char* ip : {"8.8.8.8", "198.18.0.1", "198.19.255.254", "2001:db8::1",
                         "64:ff9b::808:808", "2002:808:808::1", "::ffff:1.1.1.1"})
    EXPECT_TRUE(p.Decide(std::nullopt, A(ip), 443, Proto::kTcp).allowed) << ip;
  EXPECT_EQ(AlwaysDeniedRange(A("8.8.8.8")), std::nullopt);
  EXPECT_GE(AlwaysDenied().size(), 15u);
}

TEST(PolicyDecide, OpenedRangesLiftOnlyWhatTheyCover) {
  Policy p = Make(Mode::kAllowlist, {"10.20.0.0/16"});
  std::vector<Cidr> opened = {*ParseCidr("10.20.0.0/16")};
  EXPECT_TRUE(p.Decide(std::nullopt, A("10.20.1.1"), 80, Proto::kTcp, opened).allowed);
  EXPECT_FALSE(p.Decide(std::nullopt, A("10.20.1.1"), 80, Proto::kTcp).allowed);
  EXPECT_FALSE(p.Decide(std::nullopt, A("10.21.1.1"), 80, Proto::kTcp, opened).allowed);
  EXPECT_EQ(AlwaysDeniedRange(A("10.20.1.1"), opened), std::nullopt);
  EXPECT_EQ(AlwaysDeniedRange(A("10.21.1.1"), opened)->ToString(), "10.0.0.0/8");
  // Opened, but not in the allowlist: still refused, by the allowlist this time.
  EXPECT_EQ(Make(Mode::kAllowlist, {})
                .Decide(std::nullopt, A("10.20.1.1"), 80, Proto::kTcp, opened)
                .reason,
            "not in the allowlist");
}

TEST(PolicyDecide, AllowBeatsDenyAndModesDecideTheRest) {
  const address ip = A("198.18.0.10");
  Policy open = Make(Mode::kOpen, {"198.18.0.10"}, {"198.18.0.0/15", "evil.test"});
  EXPECT_TRUE(open.Decide(std::nullopt, ip, 80, Proto::kTcp).allowed);
  Policy::Decision d = open.Decide(std::nullopt, A("198.18.0.11"), 80, Proto::kTcp);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.reason, "denied by rule 198.18.0.0/15");
  EXPECT_EQ(open.Decide("EVIL.test", A("8.8.8.8"), 80, Proto::kTcp).reason,
            "denied by rule evil.test");
  EXPECT_TRUE(open.Decide("good.test", A("8.8.8.8"), 80, Proto::kTcp).allowed);
  EXPECT_EQ(open.Decide("good.test", A("8.8.8.8"), 80, Proto::kTcp).reason, "open");

  Policy list = Make(Mode::kAllowlist, {"pypi.org", "198.18.4.0/24"}, {"pypi.org"});
  EXPECT_TRUE(list.Decide("pypi.org", ip, 443, Proto::kTcp).allowed);  // allow beats deny
  EXPECT_EQ(list.Decide("pypi.org", ip, 443, Proto::kTcp).reason, "allowed by rule pypi.org");
  EXPECT_EQ(list.Decide("npmjs.org", ip, 443, Proto::kTcp).reason, "not in the allowlist");
  EXPECT_FALSE(list.Decide(std::nullopt, ip, 443, Proto::kTcp).allowed);
  EXPECT_TRUE(list.Decide(std::nullopt, A("198.18.4.7"), 443, Proto::kTcp).allowed);

  Policy none = Make(Mode::kNone, {"*", "0.0.0.0/0"});
  EXPECT_FALSE(none.Decide("pypi.org", ip, 443, Proto::kTcp).allowed);
  EXPECT_EQ(none.Decide("pypi.org", ip, 443, Proto::kTcp).reason, "the network policy is none");
}

TEST(PolicyDecide, PortsAndProtocols) {
  Policy p = Make(Mode::kAllowlist, {"pypi.org:443", "198.18.0.0/15:53/udp", "198.18.8.0/24"});
  const address ip = A("198.18.0.10");
  EXPECT_TRUE(p.Decide("pypi.org", ip, 443, Proto::kTcp).allowed);
  EXPECT_FALSE(p.Decide("pypi.org", ip, 80, Proto::kTcp).allowed);
  EXPECT_TRUE(p.Decide(std::nullopt, ip, 53, Proto::kUdp).allowed);
  EXPECT_FALSE(p.Decide(std::nullopt, ip, 54, Proto::kUdp).allowed);
  // A UDP rule is no TCP rule, and a TCP rule is no UDP rule.
  EXPECT_FALSE(p.Decide(std::nullopt, ip, 53, Proto::kTcp).allowed);
  EXPECT_TRUE(p.Decide(std::nullopt, A("198.18.8.1"), 53, Proto::kTcp).allowed);
  EXPECT_EQ(p.Decide(std::nullopt, A("198.18.8.1"), 54, Proto::kUdp).reason,
            "UDP needs an explicit CIDR:port/udp rule");
  // Open mode does not open UDP either.
  Policy open = Make(Mode::kOpen, {});
  EXPECT_FALSE(open.Decide(std::nullopt, A("8.8.8.8"), 53, Proto::kUdp).allowed);
  EXPECT_TRUE(open.Decide(std::nullopt, A("8.8.8.8"), 53, Proto::kTcp).allowed);
}

TEST(PolicyNames, ExactWildcardAndAny) {
  Policy p = Make(Mode::kAllowlist, {"pypi.org", "*.pythonhosted.org:443", "10.0.0.0/8"});
  EXPECT_TRUE(p.NameMayResolve("pypi.org"));
  EXPECT_TRUE(p.NameMayResolve("PYPI.ORG."));
  EXPECT_FALSE(p.NameMayResolve("www.pypi.org"));
  EXPECT_TRUE(p.NameMayResolve("files.pythonhosted.org"));
  EXPECT_TRUE(p.NameMayResolve("a.b.pythonhosted.org"));
  EXPECT_FALSE(p.NameMayResolve("pythonhosted.org"));  // the apex is not below itself
  EXPECT_FALSE(p.NameMayResolve("evilpythonhosted.org"));
  EXPECT_FALSE(p.NameMayResolve("x.evil.test"));
  EXPECT_FALSE(p.NameMayResolve("bad..name"));
  EXPECT_FALSE(p.NameMayResolve(""));

  EXPECT_TRUE(p.AllowsName("pypi.org", 80));
  EXPECT_TRUE(p.AllowsName("files.pythonhosted.org", 443));
  EXPECT_FALSE(p.AllowsName("files.pythonhosted.org", 80));
  EXPECT_FALSE(p.AllowsName("pythonhosted.org", 443));
  EXPECT_FALSE(p.AllowsName("other.test", 443));

  Policy any = Make(Mode::kAllowlist, {"*"});
  EXPECT_TRUE(any.NameMayResolve("anything.test"));
  EXPECT_TRUE(any.AllowsName("anything.test", 1));

  Policy open = Make(Mode::kOpen, {}, {"*.evil.test", "mail.test:25"});
  EXPECT_TRUE(open.NameMayResolve("good.test"));
  EXPECT_FALSE(open.NameMayResolve("x.evil.test"));
  EXPECT_TRUE(open.NameMayResolve("mail.test"));    // denied on one port only
  EXPECT_FALSE(open.AllowsName("good.test", 443));  // open mode allows no *name*: only addresses

  Policy none = Make(Mode::kNone, {"pypi.org"});
  EXPECT_FALSE(none.NameMayResolve("pypi.org"));
  EXPECT_FALSE(none.AllowsName("pypi.org", 443));
  EXPECT_FALSE(Make(Mode::kAllowlist, {}).NameMayResolve("pypi.org"));
}

TEST(PolicyJson, RoundTripAndErrors) {
  Policy p = Make(Mode::kAllowlist,
                  {"pypi.org", "*.pythonhosted.org", "140.82.112.0/20:443", "198.18.0.0/15:53/udp"},
                  {"bad.test"});
  Result<Policy> back = Policy::FromJson(p.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->mode, Mode::kAllowlist);
  ASSERT_EQ(back->allow.size(), 4u);
  EXPECT_EQ(back->allow[2].text, "140.82.112.0/20:443");
  EXPECT_EQ(back->deny[0].text, "bad.test");
  EXPECT_EQ(back->ToJson(), p.ToJson());
  EXPECT_EQ(nlohmann::json::parse(p.ToJson())["mode"], "allowlist");

  EXPECT_EQ(Policy::FromJson(R"({"allow": ["pypi.org"]})")->mode, Mode::kAllowlist);
  EXPECT_EQ(Policy::FromJson(R"({})")->mode, Mode::kNone);
  EXPECT_EQ(Policy::FromJson(R"({"mode": "open", "deny": ["x.test"]})")->mode, Mode::kOpen);

  auto error = [](const std::string& json) {
    Result<Policy> r = Policy::FromJson(json);
    EXPECT_FALSE(r.ok()) << json;
    if (!r.ok()) {
      EXPECT_EQ(r.status().err(), EINVAL);
    }
    return r.ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(error("{").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error("[]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(error(R"({"mode": "closed"})").find("\"closed\""), std::string::npos);
  EXPECT_NE(error(R"({"mode": 1})").find("\"mode\""), std::string::npos);
  EXPECT_NE(error(R"({"allow": "pypi.org"})").find("\"allow\" is not an array"), std::string::npos);
  EXPECT_NE(error(R"({"allow": [1]})").find("allow[0] is not a string"), std::string::npos);
  std::string bad = error(R"({"allow": ["ok.test"], "deny": ["a", "10.0.0.1/8"]})");
  EXPECT_NE(bad.find("deny[1]"), std::string::npos) << bad;
  EXPECT_NE(bad.find("10.0.0.1/8"), std::string::npos) << bad;
  EXPECT_NE(error(R"({"alow": []})").find("unknown field \"alow\""), std::string::npos);

  nlohmann::json many = {{"allow", nlohmann::json::array()}};
  for (size_t i = 0; i <= kMaxRules; ++i)
    many["allow"].push_back("h" + std::to_string(i) + ".test");
  EXPECT_NE(error(many.dump()).find("more than 256"), std::string::npos);
  many["allow"].erase(0);
  EXPECT_TRUE(Policy::FromJson(many.dump()).ok());  // exactly kMaxRules is fine
}

TEST(PolicyDescribe, OneLineForPeople) {
  EXPECT_EQ(Make(Mode::kAllowlist, {"pypi.org", "*.pythonhosted.org"}).Describe(),
            "allowlist: pypi.org, *.pythonhosted.org");
  EXPECT_EQ(Make(Mode::kOpen, {}).Describe(), "open");
  EXPECT_EQ(Make(Mode::kOpen, {}, {"x.test"}).Describe(), "open, deny: x.test");
  EXPECT_EQ(Make(Mode::kNone, {}).Describe(), "none");
  EXPECT_EQ(Make(Mode::kAllowlist, {}).Describe(), "allowlist: nothing");
  Policy big;
  big.mode = Mode::kAllowlist;
  for (int i = 0; i < 20; ++i) big.allow.push_back(R(("h" + std::to_string(i) + ".test").c_str()));
  std::string d = big.Describe();
  EXPECT_NE(d.find("(12 more)"), std::string::npos) << d;
  EXPECT_LT(d.size(), 200u);
}

TEST(BoxRegistry, ByAddressAndIdAndReplacement) {
  BoxRegistry reg;
  auto box = [](const char* id, const char* ip, Mode mode) {
    auto b = std::make_shared<BoxNet>();
    b->id = id;
    b->box_ip = A(ip);
    b->host_ip = A("10.213.0.1");
    b->policy.mode = mode;
    return std::shared_ptr<const BoxNet>(b);
  };
  reg.Put(box("a", "10.213.0.2", Mode::kNone));
  reg.Put(box("b", "10.213.0.6", Mode::kOpen));
  EXPECT_EQ(reg.ByAddress(A("10.213.0.2"))->id, "a");
  EXPECT_EQ(reg.ByAddress(A("::ffff:10.213.0.6"))->id, "b");  // a dual-stack socket's view
  EXPECT_EQ(reg.ByAddress(A("10.213.0.10")), nullptr);
  EXPECT_EQ(reg.ById("b")->policy.mode, Mode::kOpen);
  EXPECT_EQ(reg.All().size(), 2u);

  // A new entry replaces the old one at once; a holder of the old one keeps it.
  std::shared_ptr<const BoxNet> held = reg.ById("a");
  reg.Put(box("a", "10.213.0.2", Mode::kOpen));
  EXPECT_EQ(reg.ByAddress(A("10.213.0.2"))->policy.mode, Mode::kOpen);
  EXPECT_EQ(held->policy.mode, Mode::kNone);
  // Moving to another address drops the old mapping.
  reg.Put(box("a", "10.213.0.14", Mode::kOpen));
  EXPECT_EQ(reg.ByAddress(A("10.213.0.2")), nullptr);
  EXPECT_EQ(reg.ByAddress(A("10.213.0.14"))->id, "a");

  reg.Remove("a");
  reg.Remove("a");  // idempotent
  EXPECT_EQ(reg.ById("a"), nullptr);
  EXPECT_EQ(reg.ByAddress(A("10.213.0.14")), nullptr);
  EXPECT_EQ(reg.All().size(), 1u);
}

}  // namespace
}  // namespace sbx::network
